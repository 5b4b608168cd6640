package io.pydledger.spark;

import java.io.IOException;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

/**
 * Planning for the JVM live reader, as spark/live_log.py's group_view: every
 * node reachable from the servers option and the peers they name is asked
 * for its Metadata; the bounds are the leader's (the highest term's), or in
 * an election the followers' (any node's committed index is a valid bound:
 * what is at or below it is committed for good). Planning retries for
 * PLANNING_TIMEOUT_MS until some node answers, so it rides out an election;
 * a node that refuses the caller stops it at once with what to do.
 */
final class LiveGroup {
    static final String SERVICE = "/dledger.v1.DLedgerService/";
    static final long PLANNING_TIMEOUT_MS = 30_000, PROBE_TIMEOUT_MS = 2_000;
    static final int SUCCESS = 200, NOT_LEADER = 404, INDEX_OUT_OF_RANGE = 410, UNAUTHENTICATED = 433,
            FORBIDDEN = 434;
    private static final ExecutorService PROBES = Executors.newCachedThreadPool(task -> {
        Thread thread = new Thread(task, "dledger-probe");
        thread.setDaemon(true);
        return thread;
    });

    private LiveGroup() {
    }

    /** A node's own view (MetadataResponse). */
    static final class Node {
        String address, selfId = "", role = "", metricsAddress = "";
        long term, begin, committed;
        boolean repairing;
        final List<String> peers = new ArrayList<>();
    }

    /** What planning learnt: bounds, and the nodes to read from. */
    static final class View {
        final long begin, committed;
        final String leader;  // null: no node answered as leader
        final List<String> followers;

        View(long begin, long committed, String leader, List<String> followers) {
            this.begin = begin;
            this.committed = committed;
            this.leader = leader;
            this.followers = followers;
        }
    }

    /** A node refused the caller: planning and reading stop at once, saying which options to give. */
    static final class Refused extends IOException {
        private static final long serialVersionUID = 1L;

        Refused(boolean unauthenticated, String why) {
            super((unauthenticated ? "UNAUTHENTICATED: " : "FORBIDDEN: ") + why
                    + ". The cluster requires credentials the dledger source did not give or that it refuses: "
                    + "set the options user and secretFile (and tlsCa for TLS), or DLEDGER_USER, "
                    + "DLEDGER_SECRET_FILE and DLEDGER_TLS_CA before the Spark session starts; the user needs Sub "
                    + "on the Cluster");
        }
    }

    static View view(List<String> servers, String group, LiveAccess access) throws IOException {
        long deadline = System.currentTimeMillis() + PLANNING_TIMEOUT_MS;
        while (true) {
            View view = probe(servers, group, access);
            if (view != null) {
                return view;
            }
            if (System.currentTimeMillis() >= deadline) {
                String tls = access.tlsCa().isEmpty() ? "; a cluster with TLS needs the tlsCa option" : "";
                throw new IOException("NETWORK_ERROR: no node of group '" + group + "' answered Metadata within "
                        + PLANNING_TIMEOUT_MS / 1000 + "s (servers " + String.join(",", servers) + tls + ")");
            }
            sleep(200);
        }
    }

    /** The group as the reachable nodes see it now, or null when none answers. */
    static View probe(List<String> servers, String group, LiveAccess access) throws IOException {
        Map<String, Node> answers = new LinkedHashMap<>();
        List<String> pending = new ArrayList<>(servers);
        while (!pending.isEmpty()) {
            List<CompletableFuture<Node>> asked = new ArrayList<>();
            for (String address : pending) {
                asked.add(CompletableFuture.supplyAsync(() -> {
                    try {
                        return metadata(address, group, access);
                    } catch (IOException error) {
                        throw new CompletionException(error);
                    }
                }, PROBES));
            }
            List<String> named = new ArrayList<>();
            for (int k = 0; k < pending.size(); k++) {
                Node node;
                try {
                    node = asked.get(k).join();
                } catch (CompletionException error) {
                    if (error.getCause() instanceof Refused) {
                        throw (Refused) error.getCause();
                    }
                    throw new IOException(error.getCause());
                }
                answers.put(pending.get(k), node);
                if (node != null) {
                    named.addAll(node.peers);
                }
            }
            pending = new ArrayList<>();
            for (String address : named) {
                if (!address.isEmpty() && !answers.containsKey(address) && !pending.contains(address)) {
                    pending.add(address);
                }
            }
        }
        TreeMap<String, Node> usable = new TreeMap<>();
        for (Map.Entry<String, Node> e : answers.entrySet()) {
            if (e.getValue() != null && !e.getValue().repairing) {
                usable.put(e.getKey(), e.getValue());
            }
        }
        if (usable.isEmpty()) {
            return null;
        }
        String leader = null;
        for (Map.Entry<String, Node> e : usable.entrySet()) {
            Node n = e.getValue();
            if (n.role.equals("LEADER") && (leader == null || n.term >= usable.get(leader).term)) {
                leader = e.getKey();
            }
        }
        long begin = Long.MIN_VALUE, committed = Long.MIN_VALUE;
        if (leader != null) {
            begin = usable.get(leader).begin;
            committed = usable.get(leader).committed;
        } else {  // an election: the followers' view, a heartbeat old at most
            for (Node n : usable.values()) {
                begin = Math.max(begin, n.begin);
                committed = Math.max(committed, n.committed);
            }
        }
        List<String> ids = new ArrayList<>();
        if (leader != null) {
            ids.add(usable.get(leader).selfId);
        }
        List<String> followers = new ArrayList<>();
        for (Map.Entry<String, Node> e : usable.entrySet()) {
            if (!e.getKey().equals(leader) && !ids.contains(e.getValue().selfId)) {  // one node may be named twice
                ids.add(e.getValue().selfId);
                followers.add(e.getKey());
            }
        }
        return new View(begin, committed, leader, followers);
    }

    /** `address`'s Metadata, or null when it cannot be reached or is not of the group; Refused when it refuses. */
    static Node metadata(String address, String group, LiveAccess access) throws IOException {
        byte[] request = new Proto.Writer().bytes(1, Proto.header(group)).done();
        byte[] answer;
        try (Grpc.Connection connection = Grpc.Connection.open(address, access, PROBE_TIMEOUT_MS)) {
            answer = connection.unary(SERVICE + "Metadata", request, PROBE_TIMEOUT_MS);
        } catch (Grpc.Failure failure) {
            if (failure.refused()) {
                throw new Refused(failure.status == Grpc.UNAUTHENTICATED, failure.getMessage());
            }
            return null;
        }
        Node node = new Node();
        node.address = address;
        Proto.Reader r = new Proto.Reader(answer);
        Proto.Outcome outcome = new Proto.Outcome();
        while (r.next()) {
            switch (r.field()) {
                case 1:
                    outcome = Proto.Outcome.of(r.message());
                    break;
                case 3:
                    node.selfId = r.string();
                    break;
                case 4:
                    node.role = r.string();
                    break;
                case 5:
                    node.term = r.int64();
                    break;
                case 8:
                    node.begin = r.int64();
                    break;
                case 10:
                    node.committed = r.int64();
                    break;
                case 13:
                    node.metricsAddress = r.string();
                    break;
                case 11:
                    Proto.Reader peer = r.message();
                    while (peer.next()) {
                        if (peer.field() == 2) {
                            node.peers.add(peer.string());
                        } else {
                            peer.skip();
                        }
                    }
                    break;
                case 17:
                    node.repairing = r.bool();
                    break;
                default:
                    r.skip();
            }
        }
        if (outcome.code == UNAUTHENTICATED || outcome.code == FORBIDDEN) {
            throw new Refused(outcome.code == UNAUTHENTICATED, address + ": " + outcome.message);
        }
        return outcome.code == SUCCESS ? node : null;
    }

    static void sleep(long ms) throws IOException {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException error) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted", error);
        }
    }
}
