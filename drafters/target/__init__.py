"""The target as a drafter reads it: its decoder layers in Llama terms, for the heads initialised from the
target (``layers.py``); the target a drafter was trained for, from its training recipe's record (``record.py``),
and what every command says when a drafter meets another target (``trained_for.py``); targets with recurrent /
linear-attention layers the decoder cannot verify, refused by name (``recurrent.py``)."""
