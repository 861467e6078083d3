"""The ``modelfleet`` command line (:mod:`.main`): one module per sub-command.
"""
