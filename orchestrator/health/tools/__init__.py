"""The CPU and network check tools: for each, the command it runs and the parser and
verdict of its output (stress, iperf, mpi); a node type's promises (limits) and the
options' rules (options). Pure: nothing here runs a container."""
