"""Harness mode: third-party agents over an OpenAI-compatible endpoint, with TITO kept.

- the Qwen3 chat template (:mod:`rl.chat.template`) and the ``<tool_call>`` parser
  (:mod:`rl.chat.toolcalls`) live in ``rl.chat``, below both this package and ``rl.agent``;
- :mod:`rl.harness.session`: one trial's session: prompt -> ``TitoBuilder.add_turn``
  (strict -> normalized -> retokenized -> split) -> engine -> recorded trajectory;
- :mod:`rl.harness.openai_api`: request validation and OpenAI-shaped responses/errors;
- :mod:`rl.harness.server`: ``/v1/chat/completions`` over TCP or a unix socket;
- :mod:`rl.harness.command_agent`: a configured program run as the agent in a sandbox;
- :mod:`rl.harness.mcp_tools`: tools from stdio MCP servers as OpenAI tools.

See docs/harness.md.
"""
