"""The session store's conformance suite: written against ``sessions.protocol.StoreProtocol`` only,
parametrised over the backends (``conftest.BACKENDS``). A new backend adds its factory there and
must pass every test unchanged."""
