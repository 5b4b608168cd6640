package io.pydledger.spark;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.security.GeneralSecurityException;
import java.time.ZoneOffset;
import java.time.ZonedDateTime;
import java.time.format.DateTimeFormatter;

import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

import io.netty.handler.codec.http2.Http2Headers;

/**
 * How the JVM live reader reaches a secured cluster, as spark/options.py's
 * LiveAccess: the user, the path of its secret and of the CA (each empty:
 * DLEDGER_USER, DLEDGER_SECRET_FILE, DLEDGER_TLS_CA where the reader runs).
 * The plan carries paths, never the secret. Calls are signed as
 * dledger/rpc/credentials.py signs them (RocketMQ 5's MQv2-HMAC-SHA1 over
 * x-mq-date-time).
 */
final class LiveAccess implements Serializable {
    private static final long serialVersionUID = 1L;
    private static final DateTimeFormatter DATE_TIME = DateTimeFormatter.ofPattern("yyyyMMdd'T'HHmmss'Z'");

    private final String user;
    private final String secretFile;
    private final String tlsCa;
    private transient String secret;

    LiveAccess(String user, String secretFile, String tlsCa) {
        this.user = user;
        this.secretFile = secretFile;
        this.tlsCa = tlsCa;
    }

    private static String or(String given, String variable) {
        String value = given.isEmpty() ? System.getenv(variable) : given;
        return value == null ? "" : value.trim();
    }

    String user() {
        return or(user, "DLEDGER_USER");
    }

    String tlsCa() {
        return or(tlsCa, "DLEDGER_TLS_CA");
    }

    /** Checks what the options name (on the driver), so a bad path is an option error, not a task failure. */
    void check() throws IOException {
        String ca = tlsCa();
        if (!ca.isEmpty() && !Files.isReadable(Paths.get(ca))) {
            throw new IOException("OptionError: tlsCa: " + ca + " cannot be read");
        }
        if (!user().isEmpty()) {
            secret();
        }
    }

    private String secret() throws IOException {
        if (secret == null) {
            String path = or(secretFile, "DLEDGER_SECRET_FILE");
            if (path.isEmpty()) {
                throw new IOException("OptionError: user " + user() + " is given without secretFile");
            }
            String line;
            try (BufferedReader in = Files.newBufferedReader(Paths.get(path), StandardCharsets.UTF_8)) {
                line = in.readLine();
            } catch (IOException error) {
                throw new IOException("OptionError: secret file " + path + " cannot be read: " + error, error);
            }
            if (line == null || line.trim().isEmpty()) {
                throw new IOException("OptionError: secret file " + path + " is empty");
            }
            secret = line.trim();
        }
        return secret;
    }

    /** Adds the signature headers when there is a user. */
    void sign(Http2Headers headers) throws IOException {
        String name = user();
        if (name.isEmpty()) {
            return;
        }
        String now = ZonedDateTime.now(ZoneOffset.UTC).format(DATE_TIME);
        String signature;
        try {
            Mac mac = Mac.getInstance("HmacSHA1");
            mac.init(new SecretKeySpec(secret().getBytes(StandardCharsets.UTF_8), "HmacSHA1"));
            byte[] digest = mac.doFinal(now.getBytes(StandardCharsets.UTF_8));
            StringBuilder hex = new StringBuilder();
            for (byte b : digest) {
                hex.append(String.format("%02x", b & 0xff));
            }
            signature = hex.toString();
        } catch (GeneralSecurityException error) {
            throw new IOException("HMAC-SHA1 is not available: " + error, error);
        }
        headers.add("x-mq-date-time", now);
        headers.add("authorization", "MQv2-HMAC-SHA1 Credential=" + name + ", SignedHeaders=x-mq-date-time, "
                + "Signature=" + signature);
    }
}
