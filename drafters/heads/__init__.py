"""The parts the feature-level heads share (Medusa, EAGLE, EAGLE-3, P-EAGLE, DFlash; the kinds' own modules
stay in ``drafters/``): the heads' decoding over the target's hidden states, chains and trees
(``feature_head.py``), and their layers, attention with an explicit boolean mask and the decoder block
(``layers.py``)."""
