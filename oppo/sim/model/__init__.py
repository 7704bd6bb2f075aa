"""The SimPy model of training steps: the trainer and its devices, the decode of one round, the asynchronous
pipeline."""
