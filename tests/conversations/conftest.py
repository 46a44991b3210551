"""The engine's tests drive it through the gateway's test client (tests/gateway/conftest.py):
its fixtures, shared here."""

from tests.gateway.conftest import client, gateway_app, gateway_base_url, gateway_overrides

__all__ = ["client", "gateway_app", "gateway_base_url", "gateway_overrides"]
