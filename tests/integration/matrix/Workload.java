// The driver matrix's workload for pgJDBC with its default prepareThreshold (5): the tenth
// select runs as a named server-side prepared statement.
// Usage: java -cp postgresql.jar Workload.java JDBC_URL USER PASSWORD TABLE; prints "ok".
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.Statement;

public class Workload {
    public static void main(String[] args) throws Exception {
        String url = args[0], user = args[1], password = args[2], table = args[3];
        try (Connection conn = DriverManager.getConnection(url, user, password)) {
            try (Statement st = conn.createStatement()) {
                st.execute("DROP TABLE IF EXISTS " + table);
                st.execute("CREATE TABLE " + table + " (id int PRIMARY KEY, name text)");
            }
            String[] names = {"one", "two", "three"};
            try (PreparedStatement ins = conn.prepareStatement(
                    "INSERT INTO " + table + " VALUES (?, ?)")) {
                for (int i = 0; i < 3; i++) {
                    ins.setInt(1, i + 1);
                    ins.setString(2, names[i]);
                    ins.executeUpdate();
                }
            }
            try (PreparedStatement sel = conn.prepareStatement(
                    "SELECT name FROM " + table + " WHERE id = ?")) {
                for (int i = 0; i < 10; i++) {
                    sel.setInt(1, i % 3 + 1);
                    try (ResultSet rs = sel.executeQuery()) {
                        if (!rs.next() || !rs.getString(1).equals(names[i % 3])) {
                            throw new IllegalStateException("select " + (i % 3 + 1));
                        }
                    }
                }
            }
            conn.setAutoCommit(false);
            try (PreparedStatement ins = conn.prepareStatement(
                    "INSERT INTO " + table + " VALUES (?, ?)")) {
                ins.setInt(1, 99);
                ins.setString(2, "rolled back");
                ins.executeUpdate();
            }
            conn.rollback();
            conn.setAutoCommit(true);
            try (Statement st = conn.createStatement();
                 ResultSet rs = st.executeQuery("SELECT count(*) FROM " + table)) {
                rs.next();
                if (rs.getInt(1) != 3) {
                    throw new IllegalStateException("after the rollback: " + rs.getInt(1));
                }
            }
        }
        System.out.println("ok");
    }
}
