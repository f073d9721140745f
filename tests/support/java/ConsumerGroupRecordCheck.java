import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.ByteBuffer;
import java.util.HexFormat;

import org.apache.kafka.coordinator.common.runtime.CoordinatorRecord;
import org.apache.kafka.coordinator.group.GroupCoordinatorRecordSerde;

/**
 * Reads "KEYHEX VALUEHEX" lines (VALUEHEX "-" for a tombstone) from stdin; for each, decodes the record with
 * Kafka's own GroupCoordinatorRecordSerde (what the broker's loader and kafka-dump-log's offsets decoder use),
 * encodes it again, and prints "KEYHEX VALUEHEX<TAB>record" (or "ERROR<TAB>message").
 */
public class ConsumerGroupRecordCheck {
    public static void main(String[] args) throws Exception {
        GroupCoordinatorRecordSerde serde = new GroupCoordinatorRecordSerde();
        HexFormat hex = HexFormat.of();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String[] parts = line.trim().split(" ");
            try {
                ByteBuffer key = ByteBuffer.wrap(hex.parseHex(parts[0]));
                ByteBuffer value = parts[1].equals("-") ? null : ByteBuffer.wrap(hex.parseHex(parts[1]));
                CoordinatorRecord record = serde.deserialize(key, value);
                byte[] again = serde.serializeValue(record);
                System.out.println(hex.formatHex(serde.serializeKey(record)) + " "
                    + (again == null ? "-" : hex.formatHex(again)) + "\t" + record);
            } catch (RuntimeException e) {
                System.out.println("ERROR\t" + e);
            }
        }
    }
}
