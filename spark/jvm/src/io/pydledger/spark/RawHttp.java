package io.pydledger.spark;

import java.io.BufferedInputStream;
import java.io.Closeable;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.nio.charset.StandardCharsets;

/**
 * A committed-range raw read from a node's HTTP (metrics) port, as
 * cluster/raw_read_http.py serves it: the node sends each run's bytes from
 * its segment file with sendfile, and this reads them from a plain socket
 * straight into the message's array, so neither side copies them through
 * HTTP/2 frames (docs/spark.md measures both). The messages are the gRPC
 * Read's (raw ReadResponse), framed as gRPC frames them; an empty frame ends
 * the range, and a connection that closes before it was cut.
 *
 * A node that does not offer it (TLS or authentication on, an older node, a
 * port the reader cannot reach) is {@link Unavailable}: the reader uses gRPC.
 */
final class RawHttp implements Closeable {
    static final String PATH = "/dledger/runs";
    static final String NODE_HEADER = "X-DLedger-Node";
    static final long CONNECT_TIMEOUT_MS = 1_000;
    private static final int MAX_MESSAGE = 256 << 20;
    private static final int MAX_HEADER_LINE = 8 << 10;

    /** The node does not serve raw reads over HTTP: read over gRPC instead. */
    static final class Unavailable extends IOException {
        private static final long serialVersionUID = 1L;

        Unavailable(String why) {
            super(why);
        }
    }

    private final String address;
    private final Socket socket;
    private final DataInputStream in;

    private RawHttp(String address, Socket socket, DataInputStream in) {
        this.address = address;
        this.socket = socket;
        this.in = in;
    }

    /** The HTTP address of a node at grpcAddress whose Metadata names metricsAddress, or null. */
    static String address(String grpcAddress, String metricsAddress) {
        int colon = metricsAddress.lastIndexOf(':');
        int grpcColon = grpcAddress.lastIndexOf(':');
        if (colon <= 0 || grpcColon <= 0) {
            return null;
        }
        // The host the reader already reaches (a node may report the address it binds, 0.0.0.0 say).
        return grpcAddress.substring(0, grpcColon) + metricsAddress.substring(colon);
    }

    /** Opens the read of entries first..last of `group` from node `nodeId`. */
    static RawHttp open(String address, String nodeId, String group, long first, long last, int runBytes,
                        long timeoutMs) throws IOException {
        int colon = address.lastIndexOf(':');
        String host = address.substring(0, colon);
        if (host.startsWith("[") && host.endsWith("]")) {
            host = host.substring(1, host.length() - 1);
        }
        int port = Integer.parseInt(address.substring(colon + 1));
        Socket socket = new Socket();
        try {
            socket.setTcpNoDelay(true);
            socket.setReceiveBufferSize(4 << 20);
            try {
                socket.connect(new InetSocketAddress(host, port), (int) CONNECT_TIMEOUT_MS);
            } catch (IOException error) {
                throw new Unavailable(address + " cannot be reached (" + error.getMessage() + ")");
            }
            socket.setSoTimeout((int) Math.max(1, timeoutMs));
            String request = "GET " + PATH + "?group=" + java.net.URLEncoder.encode(group, StandardCharsets.UTF_8)
                    + "&start=" + first + "&end=" + last + "&run_bytes=" + runBytes + " HTTP/1.1\r\nHost: "
                    + address + "\r\nConnection: close\r\n\r\n";
            OutputStream out = socket.getOutputStream();
            out.write(request.getBytes(StandardCharsets.US_ASCII));
            out.flush();
            DataInputStream in = new DataInputStream(new BufferedInputStream(socket.getInputStream(), 64 << 10));
            String status = line(in);
            int contentLength = -1;
            String answering = "";
            for (String header = line(in); !header.isEmpty(); header = line(in)) {
                if (header.regionMatches(true, 0, "content-length:", 0, 15)) {
                    contentLength = Integer.parseInt(header.substring(15).trim());
                } else if (header.regionMatches(true, 0, NODE_HEADER + ":", 0, NODE_HEADER.length() + 1)) {
                    answering = header.substring(NODE_HEADER.length() + 1).trim();
                }
            }
            if (!status.startsWith("HTTP/1.1 200 ") && !status.startsWith("HTTP/1.0 200 ")) {
                String body = "";
                if (contentLength > 0 && contentLength < MAX_HEADER_LINE) {
                    byte[] text = new byte[contentLength];
                    in.readFully(text);
                    body = new String(text, StandardCharsets.UTF_8).trim();
                }
                throw new Unavailable(address + " answered " + status + (body.isEmpty() ? "" : ": " + body));
            }
            if (!answering.equals(nodeId)) {
                // Behind published ports the port a node names may be another node's.
                throw new Unavailable(address + " is node '" + answering + "', not '" + nodeId + "'");
            }
            return new RawHttp(address, socket, in);
        } catch (IOException | RuntimeException error) {
            // Whatever went wrong before the first run, gRPC reads this node
            // (and fails over as usual when the node itself is gone).
            socket.close();
            throw error instanceof Unavailable ? (Unavailable) error : new Unavailable(address + ": " + error);
        }
    }

    /** The next message within timeoutMs; null at the end of the range. */
    byte[] next(long timeoutMs) throws Grpc.Failure {
        try {
            socket.setSoTimeout((int) Math.max(1, timeoutMs));
            int flag = in.readUnsignedByte();
            int length = in.readInt();
            if (flag != 0 || length < 0 || length > MAX_MESSAGE) {
                throw new Grpc.Failure(Grpc.INTERNAL, address + ": a raw read sent a frame of flag " + flag
                        + " and length " + length);
            }
            if (length == 0) {
                return null;
            }
            byte[] message = new byte[length];
            in.readFully(message);
            return message;
        } catch (SocketTimeoutException error) {
            throw new Grpc.Failure(Grpc.DEADLINE_EXCEEDED, address + ": no run within " + timeoutMs + " ms");
        } catch (EOFException error) {
            throw new Grpc.Failure(Grpc.UNAVAILABLE, address + ": the raw read was cut before its end");
        } catch (IOException error) {
            throw new Grpc.Failure(Grpc.UNAVAILABLE, address + ": " + error.getMessage());
        }
    }

    private static String line(InputStream in) throws IOException {
        StringBuilder text = new StringBuilder();
        while (true) {
            int c = in.read();
            if (c < 0) {
                throw new EOFException("the connection closed inside the HTTP header");
            }
            if (c == '\n') {
                int end = text.length();
                return end > 0 && text.charAt(end - 1) == '\r' ? text.substring(0, end - 1) : text.toString();
            }
            if (text.length() >= MAX_HEADER_LINE) {
                throw new IOException("an HTTP header line longer than " + MAX_HEADER_LINE + " bytes");
            }
            text.append((char) c);
        }
    }

    @Override
    public void close() {
        try {
            socket.close();
        } catch (IOException ignored) {
            // closing a socket that failed: nothing left to release
        }
    }
}
