"""``python -m drafterkit.train RECIPE.yaml key.sub=value`` and ``accelerate launch -m drafterkit.train
RECIPE.yaml``."""

import sys

from drafterkit.train.run import main

if __name__ == "__main__":
    sys.exit(main())
