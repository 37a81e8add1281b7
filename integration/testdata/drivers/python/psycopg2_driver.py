"""psycopg2 against the Lattice proxy: prints key=value lines that
integration/drivers_test.go compares. psycopg2 has no protocol-level
prepared statements (only SQL PREPARE), so its statements are client-side
parameterized."""
import io
import sys

import psycopg2


def out(k, v):
    print(f"{k}={v}", flush=True)


def main(dsn):
    c = psycopg2.connect(dsn)
    c.autocommit = True
    cur = c.cursor()
    n = 0
    for i in range(1, 21):
        cur.execute("INSERT INTO drv (id, grp, name) VALUES (%s, %s, %s)", (i, i % 4, f"name-{i}"))
        n += cur.rowcount
    out("insert", n)
    cur.execute("SELECT name FROM drv WHERE id = %s", (7,))
    out("select", cur.fetchone()[0])

    c.autocommit = False
    cur.execute("UPDATE drv SET name = %s WHERE id = %s", ("tx-5", 5))
    cur.execute("SELECT name FROM drv WHERE id = %s", (5,))
    tx = cur.fetchone()[0]
    c.commit()
    c.autocommit = True
    out("tx", tx)

    cur.execute("SELECT id FROM drv ORDER BY id")
    out("fanout", ",".join(str(r[0]) for r in cur.fetchall()))
    cur.execute("SELECT id FROM drv WHERE grp = %s ORDER BY id", (1,))
    out("fanout_param", ",".join(str(r[0]) for r in cur.fetchall()))

    # Named (server-side) cursors send DECLARE, FETCH FORWARD itersize and
    # CLOSE: one in a transaction, and one WITH HOLD in autocommit, as
    # Django's iterator() declares it.
    c.autocommit = False
    named = c.cursor("drv_named")
    named.itersize = 6
    named.execute("SELECT id FROM drv WHERE grp = %s ORDER BY id DESC", (0,))
    ids = [r[0] for r in named]
    named.close()
    c.commit()
    c.autocommit = True
    held = c.cursor("drv_held", withhold=True)
    held.itersize = 4
    held.execute("SELECT id FROM drv ORDER BY id")
    ids += [r[0] for r in held]
    held.close()
    out("named_cursor", ",".join(str(i) for i in ids))

    # Large objects go by fastpath function calls (libpq's lo_* API).
    c.autocommit = False
    lo = c.lobject(0, "wb")
    lo.write(b"hello")
    oid = lo.oid
    lo.close()
    c.commit()
    lo = c.lobject(oid, "rb")
    out("large_object", lo.read().decode())
    lo.close()
    c.commit()
    c.autocommit = True

    try:
        cur.execute("INSERT INTO drv (id, grp, name) VALUES (%s, %s, %s)", (1, 1, "dup"))
        out("unique", "no error")
    except psycopg2.Error as e:
        out("unique", e.pgcode)
    cur.execute("SELECT name FROM drv WHERE id = %s", (1,))
    out("after_error", cur.fetchone()[0])

    try:
        data = io.StringIO("".join(f"{i}\t{i % 4}\tcopy-{i}\n" for i in (101, 102, 103)))
        cur.copy_expert("COPY drv (id, grp, name) FROM STDIN", data)
        out("copy_in", cur.rowcount)
    except psycopg2.Error as e:
        out("copy_in", f"ERROR {e.pgcode} " + str(e).replace("\n", " "))
    try:
        buf = io.StringIO()
        cur.copy_expert("COPY drv TO STDOUT", buf)
        out("copy_out", len(buf.getvalue().splitlines()))
    except psycopg2.Error as e:
        out("copy_out", f"ERROR {e.pgcode} " + str(e).replace("\n", " "))
    c.close()


if __name__ == "__main__":
    main(sys.argv[1])
