#!/usr/bin/env bash
# SmallBank on an RDMA cluster under Slurm: one hytra process per node, started by srun
# through PMIx, over UCX on the InfiniBand/RoCE NIC. docs/CLUSTERS.md explains every
# setting. Submit with, for instance:
#   sbatch -N 4 examples/slurm-rdma.sh            # RC (reliable connections)
#   TRANSPORT=dc sbatch -N 16 examples/slurm-rdma.sh
#
#SBATCH --job-name=hytra-smallbank
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --time=00:15:00
#SBATCH --output=hytra-%j.out
set -euo pipefail

# The binary, built on the cluster with: cargo build --release --features pmix
HYTRA=${HYTRA:-$PWD/target/release/hytra}
# rc: reliable connections, one queue pair per (worker, peer, lane); NIC READ/WRITE and
#     atomics; the reference transport of the DrTM+H paper.
# dc: dynamically connected (ConnectX-4 and later): RC semantics over a few shared
#     initiators, for large clusters where one QP per peer would not fit the NIC's cache.
# ud: unreliable datagrams: no one-sided operations in the NIC, so UCX emulates READ,
#     WRITE and atomics with messages the target's CPU executes (coherent, but nothing
#     bypasses the target): a baseline, not DrTM+H.
TRANSPORT=${TRANSPORT:-rc}
case "$TRANSPORT" in
    rc | dc | ud) ;;
    *) echo "TRANSPORT must be rc, dc or ud, not $TRANSPORT" >&2; exit 2 ;;
esac
NODES=${SLURM_JOB_NUM_NODES:?run me with sbatch}

# One NIC port per process: UCX then puts RMA and atomics on one lane, which keeps each
# connection in order with fences alone (two ports would need flushes between kinds).
# Set it to your HCA and port (ibv_devinfo lists them), e.g. mlx5_0:1.
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-mlx5_0:1}
# hytra asks for device atomics itself where an RDMA NIC may carry the cluster; saying
# it here documents the choice: every atomic, a node's own lock words included, runs in
# the NIC (docs/INVARIANTS.md M6).
export UCX_ATOMIC_MODE=device
# Registered memory is pinned: the job needs an unlimited locked-memory limit (Slurm
# passes the submitting shell's limit unless PropagateResourceLimits says otherwise).
ulimit -l unlimited || echo "warning: ulimit -l is $(ulimit -l) KiB; registration may fail" >&2
# Large regions go on huge pages where the nodes have free ones (vm.nr_hugepages); no
# setting is needed here, hytra uses them when HugePages_Free covers a region.

# Every process reads the cluster file: write it where every node sees it (a shared file
# system; SHARED_DIR, or the submission directory).
CONFIG=${SHARED_DIR:-$PWD}/hytra-$SLURM_JOB_ID.toml
trap 'rm -f "$CONFIG"' EXIT
cat > "$CONFIG" <<TOML
token = "slurm-$SLURM_JOB_ID"
transports = "$TRANSPORT"
workload = "smallbank"
design = "drtmh"
workers = 8
coroutines = 8
replication = 3
seconds = 10.0
timeout_s = 120
bench_args = ["--accounts-per-worker", "100000", "--check"]
# Under a launcher the job's size must equal this; hosts are not needed.
node_count = $NODES
TOML

# Rank r of the job is node r; node 0 prints the cluster's report and writes the JSON.
srun --mpi=pmix --ntasks-per-node=1 -n "$NODES" \
    "$HYTRA" node --config "$CONFIG" --json "hytra-$SLURM_JOB_ID.json"

# The same with Open MPI's launcher instead of srun (inside the allocation):
#   mpirun -np "$NODES" --map-by ppr:1:node -x UCX_NET_DEVICES -x UCX_ATOMIC_MODE \
#       "$HYTRA" node --config "$CONFIG"
