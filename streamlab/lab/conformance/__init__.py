"""The public conformance suites' cases as tables (wpt eventsource, Autobahn, RFC 9112 framing), and their counts."""
