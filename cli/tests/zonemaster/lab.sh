#!/bin/sh
# A Zonemaster lab with no network: a root, a `test.` TLD and the servers under test, each on
# port 53 of its own address inside a network namespace of its own, so nothing can leave the
# machine. `cli/tests/zonemaster.rs` runs it once with NSD and once with `dnsplan up` serving the
# same three zones (the stack's first zone, a static zone of its config and a zone added to
# its store at run time) and compares what Zonemaster says of each.
#
#   unshare -rn sh lab.sh MODE LAB DNSPLAN     MODE: nsd or dnsplan; LAB: an empty directory;
#                                              DNSPLAN: the dnsplan binary
#
# Writes LAB/zonemaster-ZONE.txt (zonemaster-cli's messages at INFO and above) for each zone
# and LAB/server.log. Every process runs under `timeout` and is stopped at the end.
set -eu
MODE=$1 LAB=$2 DNSPLAN=$3
NET=11.0.53                  # inside the namespace only: not a private range, as a real server's
ZONES="example.test. static.test. shop.test."
TOKEN=zonemaster-lab-token-0123456789abcdef

ip link set lo up
for h in 1 2 100 101; do ip addr add $NET.$h/32 dev lo; done

cat > $LAB/hints <<HINTS
.               3600000 IN NS a.root.test.
a.root.test.    3600000 IN A  $NET.100
HINTS
cat > $LAB/root.zone <<ZONE
\$TTL 86400
.               IN SOA  a.root.test. hostmaster.root.test. 2024010101 1800 900 604800 86400
.               IN NS   a.root.test.
a.root.test.    IN A    $NET.100
test.           IN NS   ns.nic.test.
ns.nic.test.    IN A    $NET.101
100.53.0.11.in-addr.arpa. IN PTR a.root.test.
101.53.0.11.in-addr.arpa. IN PTR ns.nic.test.
1.53.0.11.in-addr.arpa.   IN PTR ns1.example.test.
2.53.0.11.in-addr.arpa.   IN PTR ns2.example.test.
ZONE
{
  echo "\$TTL 86400"
  echo "\$ORIGIN test."
  echo "@ IN SOA ns.nic.test. hostmaster.nic.test. 2024010101 1800 900 604800 86400"
  echo "@ IN NS ns.nic.test."
  echo "ns.nic IN A $NET.101"
  for zone in $ZONES; do
    echo "$zone IN NS ns1.example.test."
    echo "$zone IN NS ns2.example.test."
  done
  echo "ns1.example IN A $NET.1"
  echo "ns2.example IN A $NET.2"
} > $LAB/test.zone
cat > $LAB/example.test.zone <<ZONE
\$ORIGIN example.test.
\$TTL 3600
@       IN SOA   ns1.example.test. hostmaster.example.test. 2024010101 14400 3600 1209600 300
@       IN NS    ns1.example.test.
@       IN NS    ns2.example.test.
@       IN MX    10 mail.example.test.
@       IN TXT   "v=spf1 mx -all"
ns1     IN A     $NET.1
ns2     IN A     $NET.2
mail    IN A     192.0.2.25
mail    IN AAAA  2001:db8::25
www     IN CNAME api.example.test.
ZONE
# The first zone is signed (DNSSEC) with the key LAB/zone.key (made here if missing): by
# dnsplan itself, or by Knot (`kzonesign`, the key imported, a policy as close to dnsplan's as
# Knot has) for NSD to serve. Its DS goes into the TLD.
[ -f $LAB/zone.key ] || "$DNSPLAN" zone key new $LAB/zone.key --dns-zone example.test. > /dev/null
"$DNSPLAN" zone ds --key $LAB/zone.key --dns-zone example.test. >> $LAB/test.zone
for zone in static shop; do
  cat > $LAB/$zone.test.zone <<ZONE
\$ORIGIN $zone.test.
\$TTL 3600
@       IN SOA   ns1.example.test. hostmaster.$zone.test. 2024010101 14400 3600 1209600 300
@       IN NS    ns1.example.test.
@       IN NS    ns2.example.test.
@       IN MX    10 mail.$zone.test.
mail    IN A     192.0.2.26
www     IN A     192.0.2.80
ZONE
done

nsd_conf() { # NAME ADDRESS... then the zones (name:file) on stdin
  name=$1; shift
  {
    echo "server:"
    for a in "$@"; do echo "  ip-address: $a"; done
    cat <<CONF
  port: 53
  username: ""
  chroot: ""
  zonesdir: "$LAB"
  database: ""
  zonelistfile: "$LAB/nsd-$name.zonelist"
  pidfile: "$LAB/nsd-$name.pid"
  xfrdfile: "$LAB/nsd-$name.xfrd"
  xfrdir: "$LAB"
  logfile: "$LAB/nsd-$name.log"
  server-count: 1
  do-ip6: no
remote-control:
  control-enable: no
CONF
    while IFS=: read -r zone file; do printf 'zone:\n  name: "%s"\n  zonefile: "%s"\n' "$zone" "$file"; done
  } > $LAB/nsd-$name.conf
}
echo ".:root.zone" | nsd_conf root $NET.100
echo "test.:test.zone" | nsd_conf tld $NET.101
timeout 600 nsd -d -c $LAB/nsd-root.conf & ROOT=$!
timeout 600 nsd -d -c $LAB/nsd-tld.conf & TLD=$!

case $MODE in
  nsd)
    mkdir -p $LAB/knot/db $LAB/knot/keys $LAB/signed
    cat > $LAB/knot.conf <<CONF
server:
    rundir: "$LAB/knot"
database:
    storage: "$LAB/knot/db"
keystore:
  - id: pemdir
    backend: pem
    config: "$LAB/knot/keys"
policy:
  - id: csk
    keystore: pemdir
    algorithm: ecdsap256sha256
    single-type-signing: on
    nsec3: off
    rrsig-lifetime: 14d
    rrsig-refresh: 7d
    ksk-lifetime: 0
    zsk-lifetime: 0
    manual: on
    dnskey-ttl: 3600
    cds-cdnskey-publish: always
zone:
  - domain: example.test.
    storage: "$LAB"
    file: "example.test.zone"
    dnssec-signing: on
    dnssec-policy: csk
CONF
    keymgr -c $LAB/knot.conf example.test. import-pem $LAB/zone.key algorithm=ecdsap256sha256 ksk=yes zsk=yes > /dev/null
    kzonesign -c $LAB/knot.conf -o $LAB/signed example.test. > /dev/null
    printf '%s\n' "example.test.:signed/example.test.zone" "static.test.:static.test.zone" "shop.test.:shop.test.zone" \
      | nsd_conf zones $NET.1 $NET.2
    timeout 600 nsd -d -c $LAB/nsd-zones.conf > $LAB/server.log 2>&1 & SERVER=$!
    ;;
  dnsplan)
    cat > $LAB/dnsplan.toml <<CONF
data_dir = "$LAB/data"
token = "$TOKEN"
[authority.dns]
listen = ["$NET.1:53", "$NET.2:53"]
[authority.control]
listen = "127.0.0.1:8053"
[authority.dns_zone]
origin = "example.test."
master_file = "$LAB/example.test.zone"
[authority.dns_zone.dnssec]
key_file = "$LAB/zone.key"
[[authority.zones]]
origin = "static.test."
master_file = "$LAB/static.test.zone"
[enactors]
zones = ["a", "b"]
[[planner.endpoint]]
name = "api.example.test."
ttl_secs = 30
check = { kind = "tcp", port = 18080, interval_ms = 500, timeout_ms = 300, rise = 1, fall = 2 }
[[planner.endpoint.target]]
address = "127.0.0.11"
zone = "a"
[[planner.endpoint.target]]
address = "127.0.0.12"
zone = "b"
[demo]
backends = true
CONF
    timeout 600 "$DNSPLAN" up --config $LAB/dnsplan.toml > $LAB/server.log 2>&1 & SERVER=$!
    ;;
esac

# Until `name TYPE` has an answer on both addresses (at most 30 s).
until_answered() {
  i=0
  until dig +time=1 +tries=1 +short @$NET.1 "$1" "$2" | grep -q . && dig +time=1 +tries=1 +short @$NET.2 "$1" "$2" | grep -q .; do
    i=$((i + 1))
    if [ $i -ge 60 ]; then echo "lab: $1 $2 not answered on $NET.1 and $NET.2 within 30 s" >&2; return 1; fi
    sleep 0.5
  done
}
status=0
until_answered example.test. SOA && until_answered static.test. SOA || status=1
if [ $MODE = dnsplan ] && [ $status = 0 ]; then
  # The plan's endpoint served, then the zone added to the store at run time.
  until_answered api.example.test. A || status=1
  "$DNSPLAN" --control http://127.0.0.1:8053 --token $TOKEN zone add --managed $LAB/shop.test.zone >> $LAB/server.log 2>&1 || status=1
fi
[ $status = 0 ] && { until_answered shop.test. SOA || status=1; }
if [ $status = 0 ]; then
  for zone in $ZONES; do
    timeout 300 zonemaster-cli --no-ipv6 --hints $LAB/hints --raw --show-level --show-module --show-testcase \
      --no-progress --level INFO "$zone" > $LAB/zonemaster-$zone.txt 2>&1 || status=1
  done
fi
kill $ROOT $TLD $SERVER 2>/dev/null || true
wait || true
exit $status
