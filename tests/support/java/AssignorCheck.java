import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;

import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.metadata.PartitionRecord;
import org.apache.kafka.common.metadata.TopicRecord;
import org.apache.kafka.coordinator.group.api.assignor.GroupAssignment;
import org.apache.kafka.coordinator.group.api.assignor.ConsumerGroupPartitionAssignor;
import org.apache.kafka.coordinator.group.api.assignor.MemberAssignment;
import org.apache.kafka.coordinator.group.api.assignor.SubscriptionType;
import org.apache.kafka.coordinator.group.assignor.RangeAssignor;
import org.apache.kafka.coordinator.group.assignor.UniformAssignor;
import org.apache.kafka.coordinator.group.modern.Assignment;
import org.apache.kafka.coordinator.group.modern.GroupSpecImpl;
import org.apache.kafka.coordinator.group.modern.MemberSubscriptionAndAssignmentImpl;
import org.apache.kafka.coordinator.group.modern.SubscribedTopicDescriberImpl;
import org.apache.kafka.image.MetadataDelta;
import org.apache.kafka.image.MetadataImage;
import org.apache.kafka.image.MetadataProvenance;

/**
 * Kafka 4.1's UniformAssignor (or RangeAssignor: argument "range") on groups read from stdin, held as Kafka's TargetAssignmentBuilder holds them (HashMap
 * of members, each current target a HashMap of topic id to HashSet of partitions). One case per blank-line-separated
 * block of tab-separated lines:
 *   topic UUID PARTITIONS
 *   member ID TOPIC,TOPIC,..  [TOPIC:P,P,..;TOPIC:P,..]     subscribed topic ids, current target
 * Prints one line per case: "MEMBER=TOPIC:P,P;TOPIC:P|MEMBER=..." (members, topics and partitions sorted), or
 * "ERROR<TAB>message".
 */
public class AssignorCheck {
    private static ConsumerGroupPartitionAssignor assignor;

    public static void main(String[] args) throws Exception {
        assignor = args.length > 0 && args[0].equals("range") ? new RangeAssignor() : new UniformAssignor();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        List<String[]> block = new ArrayList<>();
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isEmpty()) {
                run(block);
                block.clear();
            } else {
                block.add(line.split("\t", -1));
            }
        }
        run(block);
        System.out.flush();
    }

    private static Uuid uuid(String text) {
        java.util.UUID given = java.util.UUID.fromString(text);
        return new Uuid(given.getMostSignificantBits(), given.getLeastSignificantBits());
    }

    private static void run(List<String[]> block) {
        if (block.isEmpty()) return;
        MetadataDelta delta = new MetadataDelta(MetadataImage.EMPTY);
        Map<String, MemberSubscriptionAndAssignmentImpl> members = new HashMap<>();
        Map<Uuid, Map<Integer, String>> owners = new HashMap<>();
        Set<Set<Uuid>> subscriptions = new HashSet<>();
        for (String[] fields : block) {
            if (fields[0].equals("topic")) {
                Uuid id = uuid(fields[1]);
                delta.replay(new TopicRecord().setName("t-" + id).setTopicId(id));
                for (int p = 0; p < Integer.parseInt(fields[2]); p++) {
                    delta.replay(new PartitionRecord().setTopicId(id).setPartitionId(p).setReplicas(List.of(0))
                        .setIsr(List.of(0)).setLeader(0).setLeaderEpoch(0).setPartitionEpoch(0));
                }
            } else if (fields[0].equals("member")) {
                Set<Uuid> subscribed = new HashSet<>();
                for (String t : fields[2].split(",")) {
                    if (!t.isEmpty()) subscribed.add(uuid(t));
                }
                subscriptions.add(subscribed);
                Map<Uuid, Set<Integer>> current = new HashMap<>();
                if (fields.length > 3 && !fields[3].isEmpty()) {
                    for (String topic : fields[3].split(";")) {
                        String[] parts = topic.split(":");
                        Set<Integer> partitions = new HashSet<>();
                        for (String p : parts[1].split(",")) {
                            partitions.add(Integer.parseInt(p));
                            owners.computeIfAbsent(uuid(parts[0]), k -> new HashMap<>()).put(Integer.parseInt(p),
                                fields[1]);
                        }
                        current.put(uuid(parts[0]), partitions);
                    }
                }
                members.put(fields[1], new MemberSubscriptionAndAssignmentImpl(Optional.empty(), Optional.empty(),
                    subscribed, new Assignment(current)));
            }
        }
        MetadataImage image = delta.apply(MetadataProvenance.EMPTY);
        SubscriptionType type = subscriptions.size() <= 1 ? SubscriptionType.HOMOGENEOUS
            : SubscriptionType.HETEROGENEOUS;
        try {
            GroupAssignment assignment = assignor.assign(new GroupSpecImpl(members, type, owners),
                new SubscribedTopicDescriberImpl(image));
            StringBuilder out = new StringBuilder();
            for (Map.Entry<String, MemberAssignment> member : new TreeMap<>(assignment.members()).entrySet()) {
                if (out.length() > 0) out.append("|");
                out.append(member.getKey()).append("=");
                TreeMap<String, Set<Integer>> topics = new TreeMap<>();
                member.getValue().partitions().forEach((t, ps) -> {
                    if (!ps.isEmpty()) topics.put(t.toString(), ps);
                });
                List<String> parts = new ArrayList<>();
                topics.forEach((t, ps) -> parts.add(t + ":" + String.join(",",
                    new TreeSet<>(ps).stream().map(String::valueOf).toList())));
                out.append(String.join(";", parts));
            }
            System.out.println(out);
        } catch (RuntimeException e) {
            System.out.println("ERROR\t" + e);
        }
    }
}
