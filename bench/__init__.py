"""Benchmarks (`make bench`): each module's ``run()`` returns figures; :mod:`bench.run` writes them with machine, command and date."""
