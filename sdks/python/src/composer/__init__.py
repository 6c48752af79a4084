"""Composer's Python SDK: workers and clients for the Composer workflow engine.

The gRPC API (package ``composer.v1``) is generated into ``composer.v1`` by
``scripts/generate.sh``; those modules are the wire layer and not the SDK's
public interface. The hand-written ``Worker`` and ``Client`` (asyncio, over
``grpc.aio``) will be exported from this package.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
