"""`trainwatch watch` on one machine: the checker child process, the broker it starts
when none is given, and what is printed while the training command runs."""
