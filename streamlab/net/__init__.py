"""Thin asyncio glue that the server, the client and the hops share, above the protocol and below them all.

    aio.py       run the library's coroutines from a script, a test or a notebook cell alike
    serving.py   serve until signalled, the stdin-EOF watcher, ``ClientGone``
    settings.py  every setting declared once: the flags, the config object and the table of limits
    errors.py    UserError: a mistake the user can fix, printed by the command line as one line (exit 2)
    processes.py child processes for every layer: a free port, start and wait for the ready line, SIGTERM then
                 SIGKILL, die with the parent, the open-files limit

It may import only ``streamlab.protocol`` and the standard library.
"""
