"""Adapters between model providers' tool-call shapes and toold batches.

Each module (``openai``, ``anthropic``, ``gemini``, ``ollama``) offers three pure
functions; they need no provider SDK, and read the SDK's response objects as well as
their dict forms:

- ``tools(definitions)``: toold's tool definitions declared in the provider's format;
- ``calls(response)``: the tool calls of a provider response, as batch calls (``id``,
  ``name``, ``arguments``) in the model's order, keeping the provider's call ids;
- ``results(outcome_or_results)``: the provider's tool-result message(s), in the same order.

A typical turn::

    outcome = client.submit(openai.calls(response))
    messages += openai.results(outcome)
"""

from ._common import UnreadableResponse as UnreadableResponse
