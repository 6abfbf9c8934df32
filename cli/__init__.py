"""`sweeps`: the command-line front end, above every other package (it may import all of them)."""
