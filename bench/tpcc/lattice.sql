SELECT lattice_create_tree('warehouse', 'w_id', shard_count => 8);
SELECT lattice_create_tree('district', 'd_w_id', colocate_with => 'warehouse');
SELECT lattice_create_tree('customer', 'c_w_id', colocate_with => 'warehouse');
SELECT lattice_create_tree('new_order', 'no_w_id', colocate_with => 'warehouse');
SELECT lattice_create_tree('orders', 'o_w_id', colocate_with => 'warehouse');
SELECT lattice_create_tree('order_line', 'ol_w_id', colocate_with => 'warehouse');
SELECT lattice_create_tree('stock', 's_w_id', colocate_with => 'warehouse');
SELECT lattice_create_reference_table('item');
-- history has two warehouse columns: h_w_id (where the payment was made)
-- and h_c_w_id (the customer's), and the kit's consistency checks join it
-- on both (3.3.2.8 and 9 on h_w_id, 10 on h_c_w_id), which no one shard
-- key serves; it has no primary key either. So it is a reference table.
SELECT lattice_create_reference_table('history');
