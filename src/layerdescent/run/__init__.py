"""One run: its config, session, training loop, evaluation, run directory and checkpoints."""
