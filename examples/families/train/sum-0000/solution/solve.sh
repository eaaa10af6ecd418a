#!/bin/bash
paste -sd+ values.txt | bc > report.txt
