#!/bin/sh
# A small MCP server over stdio, in POSIX sh (dash, bash, busybox ash): the one trouper's
# tests start inside a sandbox, the local one or a busybox container (no python there).
# One JSON-RPC message per line; it answers initialize, ping, tools/list and tools/call.
#
# Tools: echo {text} (the text back), env {name} (a variable's value), fail {} (a tool
# error), hang {} (answers only when the next message comes: a cancel; a test kills it
# meanwhile). In its working folder it writes mcp-server.pid (its pid), mcp-calls.log (a
# line "<pid> <tool>" per call, before the call runs) and mcp-hang (once hang began).
# "$1" = fail: it writes to stderr and exits 3 before reading anything. With MCP_LINGER
# set it does not exit when its stdin ends (it becomes `sleep 3600`, same pid).
set -u
if [ "${1:-}" = fail ]; then
  echo "mcp_server.sh: cannot open its configuration (a test's failure)" >&2
  exit 3
fi
echo $$ > mcp-server.pid
TOOLS='[{"name":"echo","description":"Say the text back.","inputSchema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}},{"name":"env","description":"The value of an environment variable.","inputSchema":{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}},{"name":"fail","description":"Fail as a tool does.","inputSchema":{"type":"object","properties":{}}},{"name":"hang","description":"Answer only when the next message comes.","inputSchema":{"type":"object","properties":{}}}]'

pick() { # the first match of sed expression $1 in the message
  printf '%s\n' "$line" | sed -n "$1" | head -n 1
}
reply() { printf '{"jsonrpc":"2.0","id":%s,"result":%s}\n' "$id" "$1"; }
said() { reply "{\"content\":[{\"type\":\"text\",\"text\":\"$1\"}],\"isError\":${2:-false}}"; }
escaped() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g' | tr '\n' ' '; }

while IFS= read -r line; do
  id=$(pick 's/.*"id":\("[^"]*"\|[0-9][0-9]*\).*/\1/p')
  method=$(pick 's/.*"method":"\([^"]*\)".*/\1/p')
  case "$method" in
    initialize)
      version=$(pick 's/.*"protocolVersion":"\([^"]*\)".*/\1/p')
      reply "{\"protocolVersion\":\"$version\",\"capabilities\":{\"tools\":{}},\"serverInfo\":{\"name\":\"trouper-test-sh\",\"version\":\"1\"}}" ;;
    notifications/*) ;;
    ping) reply '{}' ;;
    tools/list) reply "{\"tools\":$TOOLS}" ;;
    tools/call)
      tool=$(printf '%s\n' "$line" | sed 's/"arguments":.*//' | sed -n 's/.*"name":"\([^"]*\)".*/\1/p')
      args=$(printf '%s\n' "$line" | sed -n 's/.*"arguments":\(.*\)/\1/p')
      echo "$$ $tool" >> mcp-calls.log
      case "$tool" in
        echo) said "$(printf '%s\n' "$args" | sed -n 's/.*"text":"\([^"]*\)".*/\1/p')" ;;
        env)
          name=$(printf '%s\n' "$args" | sed -n 's/.*"name":"\([^"]*\)".*/\1/p')
          case "$name" in
            ''|*[!A-Za-z0-9_]*) said "not a variable name" true ;;
            *) eval "value=\${$name:-}"; said "$(escaped "$value")" ;;
          esac ;;
        fail) said "the tool failed on purpose" true ;;
        hang) : > mcp-hang; IFS= read -r next; said "released" ;;
        *) said "no tool $tool" true ;;
      esac ;;
    *) [ -n "$id" ] && printf '{"jsonrpc":"2.0","id":%s,"error":{"code":-32601,"message":"no method %s"}}\n' "$id" "$method" ;;
  esac
done
# MCP_LINGER set: outlive the end of stdin, as a server that ignores it would (same pid)
if [ -n "${MCP_LINGER:-}" ]; then exec sleep 3600; fi
