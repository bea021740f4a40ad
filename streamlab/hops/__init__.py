"""What sits between the server and the reader: the stand-in proxy, its forwarders, a function platform, nginx.

    proxy.py              the reverse proxy's I/O and command line (python -m streamlab proxy)
    forwarders.py         how a hop forwards a body: in blocks, passed through, held whole, cut after N events
    compress.py           a compressing forwarder: why gzip holds a stream, and the sync flush that releases it
    heads.py              what crosses the proxy in the heads
    exchange.py           the proxy's log: one row per exchange, ending with one outcome
    function_platform.py  the proxy as a function platform: an execution limit, a buffering runtime, a bill
    nginx.py              Debian's nginx on a loopback port, from a temporary folder
    tls.py                a throwaway certificate and its SPKI pin; nginx's TLS and HTTP/2 listen lines
    settings.py           every setting of the proxy and the platform, declared once (docs/limits.md)

The forwarders are pure (bytes in, bytes out); the proxy is the one accept loop
they plug into. Hops use the protocol and net layers, never the server's code.
"""
