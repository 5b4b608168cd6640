package io.pydledger.spark;

import java.io.Closeable;
import java.io.File;
import java.io.IOException;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import javax.net.ssl.SSLException;
import javax.net.ssl.SSLParameters;

import io.netty.bootstrap.Bootstrap;
import io.netty.buffer.ByteBuf;
import io.netty.buffer.Unpooled;
import io.netty.channel.Channel;
import io.netty.channel.ChannelFuture;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.ChannelInitializer;
import io.netty.channel.ChannelOption;
import io.netty.channel.EventLoopGroup;
import io.netty.channel.nio.NioEventLoopGroup;
import io.netty.channel.socket.nio.NioSocketChannel;
import io.netty.handler.codec.http2.DefaultHttp2DataFrame;
import io.netty.handler.codec.http2.DefaultHttp2Headers;
import io.netty.handler.codec.http2.DefaultHttp2HeadersFrame;
import io.netty.handler.codec.http2.DefaultHttp2WindowUpdateFrame;
import io.netty.handler.codec.http2.Http2DataFrame;
import io.netty.handler.codec.http2.Http2FrameCodecBuilder;
import io.netty.handler.codec.http2.Http2Headers;
import io.netty.handler.codec.http2.Http2HeadersFrame;
import io.netty.handler.codec.http2.Http2MultiplexHandler;
import io.netty.handler.codec.http2.Http2ResetFrame;
import io.netty.handler.codec.http2.Http2Settings;
import io.netty.handler.codec.http2.Http2StreamChannel;
import io.netty.handler.codec.http2.Http2StreamChannelBootstrap;
import io.netty.handler.ssl.ApplicationProtocolConfig;
import io.netty.handler.ssl.ApplicationProtocolNames;
import io.netty.handler.ssl.SslContext;
import io.netty.handler.ssl.SslContextBuilder;
import io.netty.handler.ssl.SslHandler;
import io.netty.util.ReferenceCountUtil;

/**
 * Just enough of a gRPC client for the JVM live reader: unary and
 * server-streaming calls over HTTP/2, on the Netty that Spark itself ships
 * (there is no grpc-java on Spark's classpath). A call is one HTTP/2 stream:
 * headers (method path, content-type application/grpc, te: trailers, the
 * RocketMQ 5 signature when the source has credentials), one length-prefixed
 * request message, then length-prefixed response messages and trailers with
 * grpc-status. TLS trusts the source's CA and checks the node's name or IP
 * against its certificate, as the Python client does.
 *
 * Flow control is what bounds memory: a call stops reading from its stream
 * while more than MAX_QUEUED bytes of messages wait for the reader, so the
 * node's sends stop at HTTP/2's window.
 */
final class Grpc {
    static final int OK = 0, CANCELLED = 1, DEADLINE_EXCEEDED = 4, PERMISSION_DENIED = 7, INTERNAL = 13,
            UNAVAILABLE = 14, UNAUTHENTICATED = 16;
    static final int WINDOW = 8 << 20;
    static final long MAX_QUEUED = 32L << 20;
    static final long OPEN_TIMEOUT_MS = 10_000;
    private static final int MAX_MESSAGE = 256 << 20;
    private static EventLoopGroup loops;

    private Grpc() {
    }

    private static synchronized EventLoopGroup loops() {
        if (loops == null) {
            ThreadFactory daemons = task -> {
                Thread thread = new Thread(task, "dledger-grpc");
                thread.setDaemon(true);
                return thread;
            };
            loops = new NioEventLoopGroup(Math.max(2, Runtime.getRuntime().availableProcessors()), daemons);
        }
        return loops;
    }

    /** A failed call: its gRPC status code and message. */
    static final class Failure extends IOException {
        private static final long serialVersionUID = 1L;
        final int status;

        Failure(int status, String message) {
            super(message);
            this.status = status;
        }

        boolean refused() {
            return status == UNAUTHENTICATED || status == PERMISSION_DENIED;
        }
    }

    /** One HTTP/2 connection to one node. */
    static final class Connection implements Closeable {
        final String address;
        private final Channel parent;
        private final LiveAccess access;
        private final boolean tls;

        private Connection(String address, Channel parent, LiveAccess access, boolean tls) {
            this.address = address;
            this.parent = parent;
            this.access = access;
            this.tls = tls;
        }

        static Connection open(String address, LiveAccess access, long timeoutMs) throws IOException {
            int colon = address.lastIndexOf(':');
            if (colon <= 0) {
                throw new IOException("server address " + address + " is not HOST:PORT");
            }
            String host = address.substring(0, colon);
            if (host.startsWith("[") && host.endsWith("]")) {
                host = host.substring(1, host.length() - 1);
            }
            int port = Integer.parseInt(address.substring(colon + 1));
            String ca = access.tlsCa();
            SslContext ssl = ca.isEmpty() ? null : ssl(ca);
            String sslHost = host;
            Bootstrap bootstrap = new Bootstrap().group(loops()).channel(NioSocketChannel.class)
                    .option(ChannelOption.CONNECT_TIMEOUT_MILLIS, (int) Math.max(1, timeoutMs))
                    .option(ChannelOption.TCP_NODELAY, true)
                    .handler(new ChannelInitializer<Channel>() {
                        @Override
                        protected void initChannel(Channel ch) {
                            if (ssl != null) {
                                SslHandler handler = ssl.newHandler(ch.alloc(), sslHost, port);
                                SSLParameters parameters = handler.engine().getSSLParameters();
                                parameters.setEndpointIdentificationAlgorithm("HTTPS");
                                handler.engine().setSSLParameters(parameters);
                                ch.pipeline().addLast(handler);
                            }
                            ch.pipeline().addLast(Http2FrameCodecBuilder.forClient()
                                    .initialSettings(Http2Settings.defaultSettings().initialWindowSize(WINDOW))
                                    .build());
                            ch.pipeline().addLast(new Http2MultiplexHandler(new ChannelInboundHandlerAdapter()));
                        }
                    });
            ChannelFuture connected = bootstrap.connect(host, port);
            if (!connected.awaitUninterruptibly(timeoutMs + 100)) {
                connected.cancel(true);
                throw new Failure(UNAVAILABLE, address + ": no connection within " + timeoutMs + " ms");
            }
            if (!connected.isSuccess()) {
                throw new Failure(UNAVAILABLE, address + ": " + connected.cause());
            }
            Channel channel = connected.channel();
            // The connection's window: a reader takes megabytes at a time.
            channel.writeAndFlush(new DefaultHttp2WindowUpdateFrame(4 * WINDOW - 65535));
            return new Connection(address, channel, access, ssl != null);
        }

        private static SslContext ssl(String ca) throws IOException {
            try {
                return SslContextBuilder.forClient().trustManager(new File(ca))
                        .applicationProtocolConfig(new ApplicationProtocolConfig(
                                ApplicationProtocolConfig.Protocol.ALPN,
                                ApplicationProtocolConfig.SelectorFailureBehavior.NO_ADVERTISE,
                                ApplicationProtocolConfig.SelectedListenerFailureBehavior.ACCEPT,
                                ApplicationProtocolNames.HTTP_2)).build();
            } catch (SSLException | IllegalArgumentException error) {
                throw new IOException("tlsCa " + ca + ": " + error.getMessage(), error);
            }
        }

        /** Start `method` ("/package.Service/Method") with one request message; timeoutMs 0: no deadline. */
        Call call(String method, byte[] request, long timeoutMs) throws IOException {
            Call call = new Call(address);
            Http2StreamChannel stream;
            try {
                stream = new Http2StreamChannelBootstrap(parent).handler(call).open().get(OPEN_TIMEOUT_MS,
                        TimeUnit.MILLISECONDS);
            } catch (Exception error) {  // the connection closed, or no stream in time
                throw new Failure(UNAVAILABLE, address + ": no stream: " + error);
            }
            call.stream = stream;
            Http2Headers headers = new DefaultHttp2Headers().method("POST").scheme(tls ? "https" : "http")
                    .path(method).authority(address);
            headers.add("content-type", "application/grpc").add("te", "trailers")
                    .add("user-agent", "pydledger-spark-jvm");
            if (timeoutMs > 0) {
                headers.add("grpc-timeout", timeoutMs + "m");
            }
            access.sign(headers);
            ByteBuf body = Unpooled.buffer(5 + request.length);
            body.writeByte(0).writeInt(request.length).writeBytes(request);
            stream.write(new DefaultHttp2HeadersFrame(headers));
            stream.writeAndFlush(new DefaultHttp2DataFrame(body, true));
            return call;
        }

        /** A unary call's one answer. */
        byte[] unary(String method, byte[] request, long timeoutMs) throws IOException {
            try (Call call = call(method, request, timeoutMs)) {
                byte[] answer = call.next(timeoutMs + 500);
                if (answer == null) {
                    throw new Failure(INTERNAL, address + ": " + method + " answered no message");
                }
                return answer;
            }
        }

        @Override
        public void close() {
            parent.close();
        }
    }

    /** One call's answers as they arrive, for one reading thread. */
    static final class Call extends ChannelInboundHandlerAdapter implements Closeable {
        private final String address;
        private final LinkedBlockingQueue<Object> inbox = new LinkedBlockingQueue<>();
        private final AtomicLong queued = new AtomicLong();
        // The message being received: its 5-byte prefix, then its bytes,
        // copied once from the frames into the array the reader gets.
        private final byte[] prefix = new byte[5];
        private int prefixFilled;
        private byte[] receiving;
        private int messageFilled;
        private volatile Http2StreamChannel stream;
        private boolean finished;  // the event loop's: a status was queued

        Call(String address) {
            this.address = address;
        }

        /** The next message; null when the call ended well; Failure otherwise. */
        byte[] next(long timeoutMs) throws IOException {
            Object item;
            try {
                item = inbox.poll(timeoutMs, TimeUnit.MILLISECONDS);
            } catch (InterruptedException error) {
                Thread.currentThread().interrupt();
                throw new Failure(CANCELLED, address + ": interrupted");
            }
            if (item == null) {
                throw new Failure(DEADLINE_EXCEEDED, address + " sent nothing for " + timeoutMs + " ms");
            }
            if (item instanceof byte[]) {
                byte[] message = (byte[]) item;
                Http2StreamChannel s = stream;
                if (queued.addAndGet(-message.length) < MAX_QUEUED / 2 && s != null && !s.config().isAutoRead()) {
                    s.eventLoop().execute(() -> s.config().setAutoRead(true));
                }
                return message;
            }
            inbox.add(item);  // the end stays the end
            Failure status = (Failure) item;
            if (status.status == OK) {
                return null;
            }
            throw status;
        }

        @Override
        public void channelRead(ChannelHandlerContext ctx, Object msg) {
            try {
                if (msg instanceof Http2HeadersFrame) {
                    headers((Http2HeadersFrame) msg);
                } else if (msg instanceof Http2DataFrame) {
                    data(ctx, (Http2DataFrame) msg);
                } else if (msg instanceof Http2ResetFrame) {
                    finish(UNAVAILABLE, "the stream was reset (HTTP/2 error " + ((Http2ResetFrame) msg).errorCode()
                            + ")");
                }
            } finally {
                ReferenceCountUtil.release(msg);
            }
        }

        private void headers(Http2HeadersFrame frame) {
            Http2Headers headers = frame.headers();
            CharSequence status = headers.get("grpc-status");
            if (status != null) {
                CharSequence message = headers.get("grpc-message");
                int code;
                try {
                    code = Integer.parseInt(status.toString());
                } catch (NumberFormatException error) {
                    code = INTERNAL;
                }
                finish(code, message == null ? "" : percentDecoded(message.toString()));
            } else if (headers.status() != null && !"200".contentEquals(headers.status())) {
                finish(UNAVAILABLE, "HTTP status " + headers.status());
            } else if (frame.isEndStream()) {
                finish(INTERNAL, "the stream ended without a gRPC status");
            }
        }

        private void data(ChannelHandlerContext ctx, Http2DataFrame frame) {
            ByteBuf content = frame.content();
            while (content.isReadable() && !finished) {
                if (receiving == null) {
                    int take = Math.min(5 - prefixFilled, content.readableBytes());
                    content.readBytes(prefix, prefixFilled, take);
                    prefixFilled += take;
                    if (prefixFilled < 5) {
                        break;
                    }
                    int length = ((prefix[1] & 0xff) << 24) | ((prefix[2] & 0xff) << 16) | ((prefix[3] & 0xff) << 8)
                            | (prefix[4] & 0xff);
                    if (prefix[0] != 0 || length < 0 || length > MAX_MESSAGE) {
                        finish(INTERNAL, "a compressed or oversized gRPC message (" + length + " bytes)");
                        return;
                    }
                    receiving = new byte[length];
                    messageFilled = 0;
                }
                int take = Math.min(receiving.length - messageFilled, content.readableBytes());
                content.readBytes(receiving, messageFilled, take);
                messageFilled += take;
                if (messageFilled == receiving.length) {
                    queued.addAndGet(receiving.length);
                    inbox.add(receiving);
                    receiving = null;
                    prefixFilled = 0;
                }
            }
            if (queued.get() > MAX_QUEUED) {
                ctx.channel().config().setAutoRead(false);
            }
            if (frame.isEndStream()) {
                finish(INTERNAL, "the stream ended without a gRPC status");
            }
        }

        @Override
        public void channelInactive(ChannelHandlerContext ctx) {
            finish(UNAVAILABLE, "the connection closed");
        }

        @Override
        public void exceptionCaught(ChannelHandlerContext ctx, Throwable cause) {
            finish(UNAVAILABLE, cause.toString());
            ctx.close();
        }

        private void finish(int code, String message) {
            if (!finished) {
                finished = true;
                inbox.add(new Failure(code, code == OK ? "" : address + ": " + statusName(code)
                        + (message.isEmpty() ? "" : ": " + message)));
            }
        }

        /** Cancel the call if it still runs (RST_STREAM). */
        @Override
        public void close() {
            Http2StreamChannel s = stream;
            if (s != null) {
                s.close();
            }
        }
    }

    private static final String[] STATUS_NAMES = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
        "UNAUTHENTICATED"};

    static String statusName(int code) {
        return code >= 0 && code < STATUS_NAMES.length ? STATUS_NAMES[code] : "status " + code;
    }

    /** grpc-message is percent-encoded UTF-8. */
    static String percentDecoded(String text) {
        if (text.indexOf('%') < 0) {
            return text;
        }
        java.io.ByteArrayOutputStream out = new java.io.ByteArrayOutputStream();
        for (int k = 0; k < text.length(); k++) {
            char c = text.charAt(k);
            if (c == '%' && k + 2 < text.length()) {
                try {
                    out.write(Integer.parseInt(text.substring(k + 1, k + 3), 16));
                    k += 2;
                    continue;
                } catch (NumberFormatException ignored) {
                    // not an escape: keep the text as it is
                }
            }
            byte[] raw = String.valueOf(c).getBytes(java.nio.charset.StandardCharsets.UTF_8);
            out.write(raw, 0, raw.length);
        }
        return out.toString(java.nio.charset.StandardCharsets.UTF_8);
    }
}
