// The driver matrix's workload for node-postgres, with prepared statements by name.
// Usage: node workload.js CONNECTION_STRING TABLE; prints "ok" or fails with a message.
const { Client } = require('pg');

async function main() {
  const [conninfo, table] = process.argv.slice(2);
  const client = new Client({ connectionString: conninfo });
  await client.connect();
  await client.query(`DROP TABLE IF EXISTS ${table}`);
  await client.query(`CREATE TABLE ${table} (id int PRIMARY KEY, name text)`);
  for (const [id, name] of [[1, 'one'], [2, 'two'], [3, 'three']]) {
    await client.query({ name: 'matrix-insert', text: `INSERT INTO ${table} VALUES ($1, $2)`,
                         values: [id, name] });
  }
  const names = { 1: 'one', 2: 'two', 3: 'three' };
  for (let i = 0; i < 10; i++) {
    const id = (i % 3) + 1;
    const res = await client.query({ name: 'matrix-select',
                                     text: `SELECT name FROM ${table} WHERE id = $1`,
                                     values: [id] });
    if (res.rows.length !== 1 || res.rows[0].name !== names[id]) {
      throw new Error(`select ${id}: ${JSON.stringify(res.rows)}`);
    }
  }
  await client.query('BEGIN');
  await client.query({ name: 'matrix-insert', text: `INSERT INTO ${table} VALUES ($1, $2)`,
                       values: [99, 'rolled back'] });
  await client.query('ROLLBACK');
  const count = await client.query(`SELECT count(*)::int AS n FROM ${table}`);
  if (count.rows[0].n !== 3) {
    throw new Error(`after the rollback: ${count.rows[0].n} rows`);
  }
  await client.end();
  console.log('ok');
}

main().catch((err) => { console.error(err.stack || String(err)); process.exit(1); });
