// node-postgres against the Lattice proxy: prints key=value lines that
// integration/drivers_test.go compares. node-postgres has no COPY of its own
// (that is the pg-copy-streams package), so this client does no COPY.
const { Client } = require('pg');

async function main() {
  const c = new Client({ connectionString: process.argv[2] });
  await c.connect();
  const out = (k, v) => console.log(`${k}=${v}`);

  // Named query configs are server-side prepared statements in node-postgres.
  let n = 0;
  for (let i = 1; i <= 20; i++) {
    const r = await c.query({ name: 'ins', text: 'INSERT INTO drv (id, grp, name) VALUES ($1, $2, $3)', values: [i, i % 4, `name-${i}`] });
    n += r.rowCount;
  }
  out('insert', n);
  let name;
  for (let i = 0; i < 6; i++) {
    const r = await c.query({ name: 'sel', text: 'SELECT name FROM drv WHERE id = $1', values: [7] });
    name = r.rows[0].name;
  }
  out('select', name);

  await c.query('BEGIN');
  await c.query({ name: 'upd', text: 'UPDATE drv SET name = $2 WHERE id = $1', values: [5, 'tx-5'] });
  const tx = await c.query({ name: 'sel', text: 'SELECT name FROM drv WHERE id = $1', values: [5] });
  await c.query('COMMIT');
  out('tx', tx.rows[0].name);

  const all = await c.query('SELECT id FROM drv ORDER BY id');
  out('fanout', all.rows.map((r) => r.id).join(','));
  const grp = await c.query({ name: 'grp', text: 'SELECT id FROM drv WHERE grp = $1 ORDER BY id', values: [1] });
  out('fanout_param', grp.rows.map((r) => r.id).join(','));

  try {
    await c.query({ name: 'ins', text: 'INSERT INTO drv (id, grp, name) VALUES ($1, $2, $3)', values: [1, 1, 'dup'] });
    out('unique', 'no error');
  } catch (e) {
    out('unique', e.code);
  }
  const after = await c.query({ name: 'sel', text: 'SELECT name FROM drv WHERE id = $1', values: [1] });
  out('after_error', after.rows[0].name);
  await c.end();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
