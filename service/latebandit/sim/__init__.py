"""The simulator: environments in rounds, exact Ñ accounting, the vectorised runner over R runs, scenario
files, and the registry of paper reproductions (``latebandit simulate`` and ``latebandit reproduce``)."""
