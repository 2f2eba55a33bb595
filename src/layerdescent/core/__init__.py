"""The core: constraints, the Cooper problem, solvers and the update front; no files, no configs, no loops."""
