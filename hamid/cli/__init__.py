"""cli: the ``hamid`` command (``run``, ``status``, ``plan``, ``version``).

:mod:`.main` parses arguments and maps hamid's errors to exit codes;
:mod:`.render` draws tables with bars; :mod:`.plan` runs what-if placement
over a cluster file. The CLI holds no logic of its own beyond presentation.
"""
