"""The pure core: the rules, with no I/O and no Django.

The wire (frames, parsing, encoding), the error tree, leases and their
receipts, fan-out, topic history, scopes and rate limits: objects that take
values and return decisions. Every other layer of the gateway builds on these;
these import nothing but each other, the standard library, ``orjson`` and the
client's error tree (``leasecast.errors``).
"""
