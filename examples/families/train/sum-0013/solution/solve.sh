#!/bin/bash
paste -sd+ items.txt | bc > report.txt
