package io.pydledger.spark;

/** The path does not hold a readable log, or the log is damaged (spark/log_files.py's LogFilesError). */
public class LogFilesException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public LogFilesException(String message) {
        super("LogFilesError: " + message);
    }
}
