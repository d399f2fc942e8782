"""R2D2 (Kapturowski et al., 2019), recurrent Ape-X: an LSTM Q-network trained on overlapping sequences from the
distributed prioritized replay, with burn-in, value rescaling and eta-mixed priorities. Networks in `networks.py`,
the loss in `losses.py`, learning in `learning.py`, acting in `acting.py`. Not registered yet: the actor's
sequence writing and the learner's sequence feed come with it (docs/progress.md, issue 30)."""
