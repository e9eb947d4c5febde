"""Model-free lookup support: what the proposers that draft by looking text up (prompt lookup ``ngram``, suffix
decoding ``suffix``, both kinds in ``drafters/``) are built on and combined with. The token datastore for
retrieval drafts (``datastore.py``), suffix trees (``suffix_tree.py``), a trained drafter behind prompt lookup
(``hybrid.py``) or behind suffix decoding (``suffix_hybrid.py``), and the decoding shape ``drafterkit tune``
chose for a model-free proposer (``tuned_free.py``)."""
