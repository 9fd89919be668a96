-- ECHO: a cluster subscriber's proof that its subscription to a channel hears the channel's
-- master. Only the master of the channel's slot runs it (a replica answers a keyed script with
-- MOVED), so the message reaches every subscriber the master's wake-ups reach, and no other.
--
-- KEYS[1]  the channel, named as a key of its slot (nothing is read or written)
-- ARGV[1]  the message (`e<subscriber>:<n>`, which no waiter takes for a wake-up)
--
-- Returns how many subscribers on this node heard it.
return redis.call('SPUBLISH', KEYS[1], ARGV[1])
