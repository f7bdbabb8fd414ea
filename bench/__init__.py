"""gradwise's benchmarks: scripts run from a clone as ``python bench/NAME.py`` (``--help`` lists the options).

Not installed with the package (pyproject.toml's package discovery takes ``gradwise*`` only); they import
gradwise, never the reverse. Each script first puts the repository's root on ``sys.path``, so it runs the
clone's gradwise without an install and the scripts import each other as ``bench.NAME``; modules named
``_*.py`` are not scripts but parts of them (``_progress``, and ``bench/memory.py``'s measurements).
"""
