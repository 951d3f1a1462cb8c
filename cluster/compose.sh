#!/usr/bin/env bash
# Runs Docker Compose on cluster/docker-compose.yml, with whichever Compose this machine has: the plugin
# (`docker compose`) or the older standalone tool (`docker-compose`, 1.27 or later). Arguments are passed on:
#
#   cluster/image.sh && cluster/compose.sh up -d     # start the three nodes (client ports 7070, 7170, 7270)
#   cluster/compose.sh ps
#   cluster/compose.sh logs -f holdfast-2
#   cluster/compose.sh down -v                       # stop them and delete their data
set -euo pipefail
file="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/docker-compose.yml"
if docker compose version >/dev/null 2>&1; then
    exec docker compose -f "$file" "$@"
elif command -v docker-compose >/dev/null; then
    exec docker-compose -f "$file" "$@"
fi
echo "compose.sh: neither \`docker compose\` nor \`docker-compose\` is installed" >&2
exit 1
