"""``python -m train RECIPE.yaml key.sub=value`` and ``accelerate launch -m train RECIPE.yaml``."""

import sys

from train.run import main

if __name__ == "__main__":
    sys.exit(main())
