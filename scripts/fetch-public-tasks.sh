#!/usr/bin/env bash
# Fetch the public Harbor tasks that docs/containers.md ("Public tasks") runs on the container
# backend, each at the commit that table was measured at, into DEST (default /work/public-tasks;
# outside this repository: their code is theirs, not t1ops's). Needs network to github.com.
#
#   scripts/fetch-public-tasks.sh [DEST]
#   t1ops images seed python:3.11-bookworm python:3.13-slim-bookworm python:3.12.7-slim \
#       public.ecr.aws/docker/library/ubuntu:24.04        # registry-less host only
#   t1ops tasks run DEST --backend container --oracle --json
#
# Each line: task name, GitHub repository, commit, path of the task inside it ("." = the root).
set -euo pipefail
dest=${1:-/work/public-tasks}
tasks="
cost-based-query-planner-repair Vinibank56/cost-based-query-planner-repair b902381183d4764b2e3250d866141a2caab70480 .
webhook-retry-scheduler-repair Vinibank56/webhook-retry-scheduler-repair ef536be838ecda2f09e965393c569c0069bf9e1c .
json-transform-harbor-task ShivamGairola2577/json-transform-harbor-task 5592c4424782a882b1ab7e5f890354d23dd29951 .
kaggle-hello-world Kaggle/kaggle-benchmark-starter-template b8447fd63570908771572fbc35597e2923e6b98c tasks/hello-world
kenken-task Jateloz/kenken-task 6fc13e2a06627a3b4269e157b4cd3620b4629643 .
secure-archive-extraction GavinNyamboga/secure-archive-extraction 30f3a7b7157e3678f05babd192ef6ad9967ae554 .
sha256 AbdulGhaffarcs/sha256 e52bcfc6befff1c7097b49cc6eab490fe16285d5 .
tb2-log-report-fixed Adithya4080/tb2-log-report-fixed 3ee68f41756ec685698a3f5e86638ef3ff1fd0c9 .
terminal-bench-tasks-finding-triage-task ABHISHEK3209/terminal-bench-tasks-finding-triage-task 95908b225d65e3efe63cdde3dfcaecd8335260a2 .
terminal-bench2-log-report-fix Ajam214/terminal-bench2-log-report-fix 21ee1cb99dff0342a5e316b05df2e24c5b0b2cfe .
"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$dest"
echo "$tasks" | while read -r name repo commit path; do
  [ -n "$name" ] || continue
  git init -q "$work/$name"
  git -C "$work/$name" fetch -q --depth 1 "https://github.com/$repo" "$commit"
  rm -rf "${dest:?}/$name" && mkdir -p "$dest/$name"
  if [ "$path" = . ]; then
    git -C "$work/$name" archive FETCH_HEAD | tar -x -C "$dest/$name"
  else
    strip=$(($(echo "$path" | tr -cd / | wc -c) + 1))
    git -C "$work/$name" archive FETCH_HEAD "$path" | tar -x -C "$dest/$name" --strip-components="$strip"
  fi
  echo "$name <- $repo@${commit:0:12}${path:+ $path}"
done
