"""One process's moving parts on the topic side: the broadcaster, the shared
Redis streams that relay topics between processes, and the topic settings cache.
"""
