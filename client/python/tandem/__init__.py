"""The Python SDK for a tandem server. See tandem.client for the API.

Import it from the build tree, where the package sits beside the gRPC stubs
generated from protos/tandem/v1/inference.proto at build time:
    PYTHONPATH=build/python python3 -c "import tandem"
"""

from tandem.client import (BeamProgress, BeamSequence, Client, Generation, TandemError, Token, TopLogprob,
                           Usage, default_target)

__all__ = ["BeamProgress", "BeamSequence", "Client", "Generation", "TandemError", "Token", "TopLogprob", "Usage",
           "default_target"]
