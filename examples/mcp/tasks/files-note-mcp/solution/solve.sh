#!/bin/bash
# Reference outcome of one files_write_file call: the file, and the call record the MCP
# server (examples/harness/mcp_files_server.py) appends. An agent must make the call itself.
printf 'ready\n' > notes.txt
printf '{"tool": "write_file", "path": "notes.txt"}\n' >> .mcp_calls.jsonl
