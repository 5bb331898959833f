#!/usr/bin/env bash
# Opens the built site in headless Chromium and saves screenshots of a reference page and of a guide
# with the attention-pattern pictures, to check that the site renders in a real browser (styles,
# API reference, images). Builds the site first if site/ is missing. Output: $1 (default
# site-screenshots/). Needs Chromium (Debian: apt-get install chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
  echo "scripts/docs_screenshot.sh: no Chromium found (Debian: apt-get install chromium)" >&2
  exit 2
fi
[ -f site/index.html ] || bash scripts/docs.sh
out=${1:-site-screenshots}
mkdir -p "$out"
port=${DOCS_PORT:-8765}
python3 -m http.server "$port" --bind 127.0.0.1 --directory site > /dev/null 2>&1 &
server=$!
trap 'kill "$server"' EXIT
for _ in $(seq 50); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/')" 2> /dev/null && break
  sleep 0.1
done
for page in reference/attention guides/long_contexts; do
  file="$out/${page//\//_}.png"
  "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,2600 \
    --virtual-time-budget=3000 --screenshot="$file" "http://127.0.0.1:$port/$page/" > /dev/null 2>&1
  echo "$file"
done
