"""A step window's life, apart from Faust: what is stored per window, when it closes, when
it waits, and what it has already folded and emitted.  Nothing here touches a broker, so
the whole life cycle is tested with a dict for a table and a number for a clock."""
