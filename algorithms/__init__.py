"""The learning algorithms, each in its own package behind one seam (`apexrl.algorithms.registry`).

An algorithm is a package with three parts, which the wiring (learner loop, actor loop, evaluator, checkpoints,
launcher) reaches only through the registry and never by name:
- `__init__.py`: its `ALGORITHM` record: name, the action space it plays, its default settings (no torch);
- `acting.py`: what an actor needs: the policy rebuilt from published weights (numpy, or torch for convolutions),
  exploration, and the initial priorities of its transitions; it never imports the learning side;
- `learning.py`: what the learner needs: networks, the update, the weights it publishes, its checkpoint state.

Importing this package loads nothing else: an actor of a vector environment never imports torch.
"""
