// pgjdbc against the Lattice proxy: prints key=value lines that
// integration/drivers_test.go compares. The URL sets prepareThreshold=2, so
// from the second execution on a PreparedStatement is a server-side named
// statement; every statement here runs more often than that.
import java.io.StringReader;
import java.io.StringWriter;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;

import org.postgresql.PGConnection;
import org.postgresql.PGStatement;
import org.postgresql.copy.CopyManager;
import org.postgresql.core.BaseConnection;
import org.postgresql.largeobject.LargeObject;
import org.postgresql.largeobject.LargeObjectManager;

public class Driver {
    static void out(String k, Object v) {
        System.out.println(k + "=" + v);
        System.out.flush();
    }

    static String ids(ResultSet rs) throws SQLException {
        List<String> out = new ArrayList<>();
        while (rs.next()) {
            out.add(Long.toString(rs.getLong(1)));
        }
        return String.join(",", out);
    }

    public static void main(String[] args) throws Exception {
        try (Connection c = DriverManager.getConnection(args[0])) {
            int n = 0;
            boolean serverPrepared;
            try (PreparedStatement ps = c.prepareStatement("INSERT INTO drv (id, grp, name) VALUES (?, ?, ?)")) {
                for (int i = 1; i <= 20; i++) {
                    ps.setLong(1, i);
                    ps.setInt(2, i % 4);
                    ps.setString(3, "name-" + i);
                    n += ps.executeUpdate();
                }
                serverPrepared = ps.unwrap(PGStatement.class).isUseServerPrepare();
            }
            out("insert", n);
            String name = null;
            try (PreparedStatement ps = c.prepareStatement("SELECT name FROM drv WHERE id = ?")) {
                for (int i = 0; i < 6; i++) {
                    ps.setLong(1, 7);
                    try (ResultSet rs = ps.executeQuery()) {
                        rs.next();
                        name = rs.getString(1);
                    }
                }
                serverPrepared = serverPrepared && ps.unwrap(PGStatement.class).isUseServerPrepare();
            }
            out("select", name);
            out("server_prepared", serverPrepared);

            c.setAutoCommit(false);
            String tx = null;
            try (PreparedStatement upd = c.prepareStatement("UPDATE drv SET name = ? WHERE id = ?");
                 PreparedStatement sel = c.prepareStatement("SELECT name FROM drv WHERE id = ?")) {
                for (int i = 0; i < 3; i++) {
                    upd.setString(1, "tx-5");
                    upd.setLong(2, 5);
                    upd.executeUpdate();
                    sel.setLong(1, 5);
                    try (ResultSet rs = sel.executeQuery()) {
                        rs.next();
                        tx = rs.getString(1);
                    }
                }
            }
            c.commit();
            c.setAutoCommit(true);
            out("tx", tx);

            try (Statement st = c.createStatement(); ResultSet rs = st.executeQuery("SELECT id FROM drv ORDER BY id")) {
                out("fanout", ids(rs));
            }
            String grp = null;
            try (PreparedStatement ps = c.prepareStatement("SELECT id FROM drv WHERE grp = ? ORDER BY id")) {
                for (int i = 0; i < 3; i++) {
                    ps.setInt(1, 1);
                    try (ResultSet rs = ps.executeQuery()) {
                        grp = ids(rs);
                    }
                }
            }
            out("fanout_param", grp);

            // A fetch size inside a transaction makes pgjdbc read the
            // result in batches (Execute with a row limit).
            c.setAutoCommit(false);
            try (Statement st = c.createStatement()) {
                st.setFetchSize(7);
                try (ResultSet rs = st.executeQuery("SELECT id FROM drv ORDER BY id")) {
                    out("fetch_size", ids(rs));
                }
            }
            c.commit();
            // Large objects go by fastpath function calls.
            LargeObjectManager lom = c.unwrap(PGConnection.class).getLargeObjectAPI();
            long oid = lom.createLO(LargeObjectManager.READWRITE);
            try (LargeObject lo = lom.open(oid, LargeObjectManager.WRITE)) {
                lo.write("hello".getBytes());
            }
            c.commit();
            try (LargeObject lo = lom.open(oid, LargeObjectManager.READ)) {
                out("large_object", new String(lo.read(100)));
            }
            c.commit();
            c.setAutoCommit(true);

            try (PreparedStatement ps = c.prepareStatement("INSERT INTO drv (id, grp, name) VALUES (?, ?, ?)")) {
                ps.setLong(1, 1);
                ps.setInt(2, 1);
                ps.setString(3, "dup");
                ps.executeUpdate();
                out("unique", "no error");
            } catch (SQLException e) {
                out("unique", e.getSQLState());
            }
            try (PreparedStatement ps = c.prepareStatement("SELECT name FROM drv WHERE id = ?")) {
                ps.setLong(1, 1);
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    out("after_error", rs.getString(1));
                }
            }

            CopyManager cm = c.unwrap(BaseConnection.class).getCopyAPI();
            try {
                long rows = cm.copyIn("COPY drv (id, grp, name) FROM STDIN",
                        new StringReader("101\t1\tcopy-101\n102\t2\tcopy-102\n103\t3\tcopy-103\n"));
                out("copy_in", rows);
            } catch (SQLException e) {
                out("copy_in", "ERROR " + e.getSQLState() + " " + e.getMessage().replace('\n', ' '));
            }
            try {
                StringWriter w = new StringWriter();
                cm.copyOut("COPY drv TO STDOUT", w);
                out("copy_out", w.toString().lines().count());
            } catch (SQLException e) {
                out("copy_out", "ERROR " + e.getSQLState() + " " + e.getMessage().replace('\n', ' '));
            }
        }
    }
}
