"""psycopg 3 against the Lattice proxy: prints key=value lines that
integration/drivers_test.go compares. prepare=True makes psycopg use
server-side prepared statements from the first execution."""
import sys

import psycopg


def out(k, v):
    print(f"{k}={v}", flush=True)


def main(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        n = 0
        for i in range(1, 21):
            cur = c.execute("INSERT INTO drv (id, grp, name) VALUES (%s, %s, %s)", (i, i % 4, f"name-{i}"), prepare=True)
            n += cur.rowcount
        out("insert", n)
        for _ in range(6):
            name = c.execute("SELECT name FROM drv WHERE id = %s", (7,), prepare=True).fetchone()[0]
        out("select", name)

        with c.transaction():
            c.execute("UPDATE drv SET name = %s WHERE id = %s", ("tx-5", 5), prepare=True)
            tx = c.execute("SELECT name FROM drv WHERE id = %s", (5,), prepare=True).fetchone()[0]
        out("tx", tx)

        out("fanout", ",".join(str(r[0]) for r in c.execute("SELECT id FROM drv ORDER BY id")))
        out("fanout_param", ",".join(str(r[0]) for r in c.execute("SELECT id FROM drv WHERE grp = %s ORDER BY id", (1,), prepare=True)))

        # Server-side cursors: DECLARE with a parameter, a Describe of the
        # cursor as a portal, FETCH FORWARD itersize, CLOSE, all in the
        # extended protocol; one in a transaction, one WITH HOLD.
        with c.transaction():
            with c.cursor(name="drv_named") as named:
                named.itersize = 6
                named.execute("SELECT id FROM drv WHERE grp = %s ORDER BY id DESC", (0,))
                ids = [r[0] for r in named]
        with c.cursor(name="drv_held", withhold=True) as held:
            held.itersize = 4
            held.execute("SELECT id FROM drv ORDER BY id")
            ids += [r[0] for r in held]
        out("named_cursor", ",".join(str(i) for i in ids))

        try:
            c.execute("INSERT INTO drv (id, grp, name) VALUES (%s, %s, %s)", (1, 1, "dup"), prepare=True)
            out("unique", "no error")
        except psycopg.Error as e:
            out("unique", e.sqlstate)
        out("after_error", c.execute("SELECT name FROM drv WHERE id = %s", (1,), prepare=True).fetchone()[0])

        try:
            with c.cursor() as cur:
                with cur.copy("COPY drv (id, grp, name) FROM STDIN") as cp:
                    for i in (101, 102, 103):
                        cp.write_row((i, i % 4, f"copy-{i}"))
                out("copy_in", cur.rowcount)
        except psycopg.Error as e:
            out("copy_in", f"ERROR {e.sqlstate} " + str(e).replace("\n", " "))
        try:
            rows = []
            with c.cursor() as cur:
                with cur.copy("COPY drv TO STDOUT") as cp:
                    for row in cp.rows():
                        rows.append(row)
            out("copy_out", len(rows))
        except psycopg.Error as e:
            out("copy_out", f"ERROR {e.sqlstate} " + str(e).replace("\n", " "))


if __name__ == "__main__":
    main(sys.argv[1])
