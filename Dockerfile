# The default sandbox image, propio-sandbox/agent:latest, that the built-in
# profiles run:
#
#   docker build -t propio-sandbox/agent:latest .
#
# Agent tools on Debian bookworm: git, ssh, curl, bash, make, Node.js with npm, Python 3.
# An agent image extends it and puts its program under /app:
#
#   FROM propio-sandbox/agent:latest
#   COPY . /app/
#   CMD ["node", "/app/dist/index.js"]
#
# Nothing secret is baked in: API keys arrive at run time through the profile's
# env.pass. There is no USER: the launcher runs the sandbox as the invoking
# uid:gid, with HOME=/home/sandbox on a private tmpfs, in /workspace.
#
# Written for the legacy builder as well as BuildKit (no heredocs, no --mount).
# Without a registry, e2e/base-image.sh makes debian:bookworm-slim locally.
FROM debian:bookworm-slim

LABEL org.opencontainers.image.title="propio-sandbox/agent" \
      org.opencontainers.image.description="Default propio-sandbox image: git, ssh, curl, bash, make, Node.js, Python 3"

ENV LANG=C.UTF-8

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      bash \
      ca-certificates \
      curl \
      git \
      make \
      nodejs \
      npm \
      openssh-client \
      python3 \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /var/log/apt/* /var/log/dpkg.log

WORKDIR /app
RUN printf '%s\n' \
      'This is the agent directory of the propio-sandbox/agent image.' \
      '' \
      'An agent image extends propio-sandbox/agent and copies its program here,' \
      'then names it as the command:' \
      '' \
      '    FROM propio-sandbox/agent:latest' \
      '    COPY . /app/' \
      '    CMD ["node", "/app/dist/index.js"]' \
      '' \
      'Use absolute /app/ paths: the working directory inherited from this image' \
      'is /workspace, where propio-sandbox mounts the directory it is run in.' \
      'A profile can mount read-only configuration here too (for example' \
      '/app/.propio); nothing under /app should hold secrets.' \
      > /app/README

WORKDIR /workspace
CMD ["bash"]
