"""The lock protocol: key names, the decisions on replies, the Lua scripts.

``keys`` and ``protocol`` do no I/O; ``scripts`` assembles the Lua files in
``lua/`` and runs them through ``core.io.calls``.
"""
