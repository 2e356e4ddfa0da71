#!/usr/bin/env bash
# etcd whose members speak TLS to each other: what `python -m bench.vs_etcd --etcd-peer-tls` gives the
# anchor's etcd_cluster.sh as its ETCD binary (that script's peer URLs are plain http://). The peer URLs
# become https:// and each member makes a self-signed peer certificate (etcd's --peer-auto-tls): every
# Raft message then pays the TLS record layer, as Epochlog's members do with their default mutual TLS.
# The client URLs stay plain HTTP, as Epochlog's client faces in the bench.
set -euo pipefail
args=()
peer_urls=0
for arg in "$@"; do
  if ((peer_urls)); then
    arg=${arg//http:\/\//https:\/\/}
    peer_urls=0
  fi
  case "$arg" in
    --listen-peer-urls | --initial-advertise-peer-urls | --initial-cluster) peer_urls=1 ;;
  esac
  args+=("$arg")
done
exec "${ETCD_BINARY:-/usr/bin/etcd}" "${args[@]}" --peer-auto-tls
