"""Stage 1, the specs: what a stack, a component, a kind of source, a rule and a lock's data are. Pure data and
checks over it: nothing here reaches the network, the engine or the disk beyond reading the stack files."""
