"""The ``pyrula`` command line: ``pyrula worker`` and ``pyrula runs ...``.

One module per command group. Each command parses its flags, calls the public
:mod:`pyrula.workflows` API and renders the answer (:mod:`pyrula.cli.render`); no engine
logic lives here.
"""
